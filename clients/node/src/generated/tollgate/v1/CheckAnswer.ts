// Original file: proto/tollgate/v1/key_limits.proto

import type { Duration as _google_protobuf_Duration, Duration__Output as _google_protobuf_Duration__Output } from '../../google/protobuf/Duration';
import type { Timestamp as _google_protobuf_Timestamp, Timestamp__Output as _google_protobuf_Timestamp__Output } from '../../google/protobuf/Timestamp';

export interface CheckAnswer {
  'allowed'?: (boolean);
  'remainingTokens'?: (number | string);
  'retryAfter'?: (_google_protobuf_Duration | null);
  'resetAfter'?: (_google_protobuf_Duration | null);
  'refillRate'?: (number | string);
  'burstLimit'?: (number | string);
  'replayed'?: (boolean);
  'quotaRemaining'?: (number | string);
  'quotaResetsAt'?: (_google_protobuf_Timestamp | null);
  'shadowRefused'?: (boolean);
  '_quotaRemaining'?: "quotaRemaining";
}

export interface CheckAnswer__Output {
  'allowed': (boolean);
  'remainingTokens': (number);
  'retryAfter': (_google_protobuf_Duration__Output | null);
  'resetAfter': (_google_protobuf_Duration__Output | null);
  'refillRate': (number);
  'burstLimit': (number);
  'replayed': (boolean);
  'quotaRemaining'?: (number);
  'quotaResetsAt': (_google_protobuf_Timestamp__Output | null);
  'shadowRefused': (boolean);
  '_quotaRemaining'?: "quotaRemaining";
}
