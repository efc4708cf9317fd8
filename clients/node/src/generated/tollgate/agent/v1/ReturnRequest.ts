// Original file: proto/tollgate/agent/v1/agent.proto


export interface ReturnRequest {
  'tenant'?: (string);
  'bucket'?: (string);
  'tokens'?: (number | string);
  'requestId'?: (string);
}

export interface ReturnRequest__Output {
  'tenant': (string);
  'bucket': (string);
  'tokens': (number);
  'requestId': (string);
}
