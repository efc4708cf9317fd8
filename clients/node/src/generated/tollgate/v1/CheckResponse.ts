// Original file: proto/tollgate/v1/key_limits.proto

import type { CheckAnswer as _tollgate_v1_CheckAnswer, CheckAnswer__Output as _tollgate_v1_CheckAnswer__Output } from '../../tollgate/v1/CheckAnswer';

export interface CheckResponse {
  'allowed'?: (boolean);
  'answers'?: (_tollgate_v1_CheckAnswer)[];
}

export interface CheckResponse__Output {
  'allowed': (boolean);
  'answers': (_tollgate_v1_CheckAnswer__Output)[];
}
