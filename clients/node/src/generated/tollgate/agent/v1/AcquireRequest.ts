// Original file: proto/tollgate/agent/v1/agent.proto

import type { Duration as _google_protobuf_Duration, Duration__Output as _google_protobuf_Duration__Output } from '../../../google/protobuf/Duration';

export interface AcquireRequest {
  'tenant'?: (string);
  'bucket'?: (string);
  'tokens'?: (number | string);
  'maxWait'?: (_google_protobuf_Duration | null);
  'requestId'?: (string);
}

export interface AcquireRequest__Output {
  'tenant': (string);
  'bucket': (string);
  'tokens': (number);
  'maxWait': (_google_protobuf_Duration__Output | null);
  'requestId': (string);
}
