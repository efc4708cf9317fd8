// Original file: proto/tollgate/agent/v1/agent.proto

import type { Duration as _google_protobuf_Duration, Duration__Output as _google_protobuf_Duration__Output } from '../../../google/protobuf/Duration';

export interface AcquireResponse {
  'admitted'?: (boolean);
  'waited'?: (_google_protobuf_Duration | null);
  'fallback'?: (boolean);
}

export interface AcquireResponse__Output {
  'admitted': (boolean);
  'waited': (_google_protobuf_Duration__Output | null);
  'fallback': (boolean);
}
