// Original file: proto/tollgate/agent/v1/agent.proto

import type { Long } from '@grpc/proto-loader';

export interface StatusResponse {
  'tokens'?: (number | string);
  'debt'?: (number | string);
  'trickleRate'?: (number | string);
  'fallbackActive'?: (boolean);
  'fallbackRate'?: (number | string);
  'waiters'?: (number | string | Long);
  'queuedTokens'?: (number | string);
  'usageRate'?: (number | string);
  'instanceId'?: (number);
}

export interface StatusResponse__Output {
  'tokens': (number);
  'debt': (number);
  'trickleRate': (number);
  'fallbackActive': (boolean);
  'fallbackRate': (number);
  'waiters': (string);
  'queuedTokens': (number);
  'usageRate': (number);
  'instanceId': (number);
}
