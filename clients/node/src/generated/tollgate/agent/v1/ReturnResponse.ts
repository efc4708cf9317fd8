// Original file: proto/tollgate/agent/v1/agent.proto


export interface ReturnResponse {
  'returned'?: (number | string);
}

export interface ReturnResponse__Output {
  'returned': (number);
}
