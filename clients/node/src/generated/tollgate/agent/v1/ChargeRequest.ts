// Original file: proto/tollgate/agent/v1/agent.proto


export interface ChargeRequest {
  'tenant'?: (string);
  'bucket'?: (string);
  'tokens'?: (number | string);
  'requestId'?: (string);
}

export interface ChargeRequest__Output {
  'tenant': (string);
  'bucket': (string);
  'tokens': (number);
  'requestId': (string);
}
