// Original file: proto/tollgate/agent/v1/agent.proto

import type { Long } from '@grpc/proto-loader';

export interface ReportRequest {
  'tenant'?: (string);
  'readRequests'?: (number | string | Long);
  'readBytes'?: (number | string | Long);
  'writeRequests'?: (number | string | Long);
  'writeBytes'?: (number | string | Long);
  'cpuSeconds'?: (number | string);
  'egressBytes'?: (number | string | Long);
  'requestId'?: (string);
}

export interface ReportRequest__Output {
  'tenant': (string);
  'readRequests': (string);
  'readBytes': (string);
  'writeRequests': (string);
  'writeBytes': (string);
  'cpuSeconds': (number);
  'egressBytes': (string);
  'requestId': (string);
}
