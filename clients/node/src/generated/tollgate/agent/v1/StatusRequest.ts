// Original file: proto/tollgate/agent/v1/agent.proto


export interface StatusRequest {
  'tenant'?: (string);
  'bucket'?: (string);
}

export interface StatusRequest__Output {
  'tenant': (string);
  'bucket': (string);
}
