// Original file: proto/tollgate/v1/key_limits.proto

import type { CheckItem as _tollgate_v1_CheckItem, CheckItem__Output as _tollgate_v1_CheckItem__Output } from '../../tollgate/v1/CheckItem';

export interface CheckRequest {
  'items'?: (_tollgate_v1_CheckItem)[];
}

export interface CheckRequest__Output {
  'items': (_tollgate_v1_CheckItem__Output)[];
}
