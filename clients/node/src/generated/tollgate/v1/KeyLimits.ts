// Original file: proto/tollgate/v1/key_limits.proto

import type * as grpc from '@grpc/grpc-js'
import type { MethodDefinition } from '@grpc/proto-loader'
import type { CheckRequest as _tollgate_v1_CheckRequest, CheckRequest__Output as _tollgate_v1_CheckRequest__Output } from '../../tollgate/v1/CheckRequest';
import type { CheckResponse as _tollgate_v1_CheckResponse, CheckResponse__Output as _tollgate_v1_CheckResponse__Output } from '../../tollgate/v1/CheckResponse';

export interface KeyLimitsClient extends grpc.Client {
  Check(argument: _tollgate_v1_CheckRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Check(argument: _tollgate_v1_CheckRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Check(argument: _tollgate_v1_CheckRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  Check(argument: _tollgate_v1_CheckRequest, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  check(argument: _tollgate_v1_CheckRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  check(argument: _tollgate_v1_CheckRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  check(argument: _tollgate_v1_CheckRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  check(argument: _tollgate_v1_CheckRequest, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  
}

export interface KeyLimitsHandlers extends grpc.UntypedServiceImplementation {
  Check: grpc.handleUnaryCall<_tollgate_v1_CheckRequest__Output, _tollgate_v1_CheckResponse>;
  
}

export interface KeyLimitsDefinition extends grpc.ServiceDefinition {
  Check: MethodDefinition<_tollgate_v1_CheckRequest, _tollgate_v1_CheckResponse, _tollgate_v1_CheckRequest__Output, _tollgate_v1_CheckResponse__Output>
}
