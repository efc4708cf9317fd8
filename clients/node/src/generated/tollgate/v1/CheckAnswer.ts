// Original file: proto/tollgate/v1/key_limits.proto

import type { Duration as _google_protobuf_Duration, Duration__Output as _google_protobuf_Duration__Output } from '../../google/protobuf/Duration';

export interface CheckAnswer {
  'allowed'?: (boolean);
  'remainingTokens'?: (number | string);
  'retryAfter'?: (_google_protobuf_Duration | null);
  'resetAfter'?: (_google_protobuf_Duration | null);
  'refillRate'?: (number | string);
  'burstLimit'?: (number | string);
  'replayed'?: (boolean);
}

export interface CheckAnswer__Output {
  'allowed': (boolean);
  'remainingTokens': (number);
  'retryAfter': (_google_protobuf_Duration__Output | null);
  'resetAfter': (_google_protobuf_Duration__Output | null);
  'refillRate': (number);
  'burstLimit': (number);
  'replayed': (boolean);
}
