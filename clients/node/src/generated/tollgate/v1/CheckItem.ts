// Original file: proto/tollgate/v1/key_limits.proto


export interface CheckItem {
  'tenantId'?: (string);
  'bucket'?: (string);
  'key'?: (string);
  'tokens'?: (number | string);
  'requestId'?: (string);
}

export interface CheckItem__Output {
  'tenantId': (string);
  'bucket': (string);
  'key': (string);
  'tokens': (number);
  'requestId': (string);
}
