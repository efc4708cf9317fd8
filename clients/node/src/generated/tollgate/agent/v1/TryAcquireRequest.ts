// Original file: proto/tollgate/agent/v1/agent.proto


export interface TryAcquireRequest {
  'tenant'?: (string);
  'bucket'?: (string);
  'tokens'?: (number | string);
  'requestId'?: (string);
}

export interface TryAcquireRequest__Output {
  'tenant': (string);
  'bucket': (string);
  'tokens': (number);
  'requestId': (string);
}
