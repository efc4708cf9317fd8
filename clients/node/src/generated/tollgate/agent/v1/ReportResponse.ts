// Original file: proto/tollgate/agent/v1/agent.proto


export interface ReportResponse {
  'requestUnits'?: (number | string);
}

export interface ReportResponse__Output {
  'requestUnits': (number);
}
