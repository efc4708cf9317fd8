// Original file: proto/tollgate/agent/v1/agent.proto

import type * as grpc from '@grpc/grpc-js'
import type { MethodDefinition } from '@grpc/proto-loader'
import type { AcquireRequest as _tollgate_agent_v1_AcquireRequest, AcquireRequest__Output as _tollgate_agent_v1_AcquireRequest__Output } from '../../../tollgate/agent/v1/AcquireRequest';
import type { AcquireResponse as _tollgate_agent_v1_AcquireResponse, AcquireResponse__Output as _tollgate_agent_v1_AcquireResponse__Output } from '../../../tollgate/agent/v1/AcquireResponse';
import type { ChargeRequest as _tollgate_agent_v1_ChargeRequest, ChargeRequest__Output as _tollgate_agent_v1_ChargeRequest__Output } from '../../../tollgate/agent/v1/ChargeRequest';
import type { ChargeResponse as _tollgate_agent_v1_ChargeResponse, ChargeResponse__Output as _tollgate_agent_v1_ChargeResponse__Output } from '../../../tollgate/agent/v1/ChargeResponse';
import type { CheckRequest as _tollgate_v1_CheckRequest, CheckRequest__Output as _tollgate_v1_CheckRequest__Output } from '../../../tollgate/v1/CheckRequest';
import type { CheckResponse as _tollgate_v1_CheckResponse, CheckResponse__Output as _tollgate_v1_CheckResponse__Output } from '../../../tollgate/v1/CheckResponse';
import type { ReportRequest as _tollgate_agent_v1_ReportRequest, ReportRequest__Output as _tollgate_agent_v1_ReportRequest__Output } from '../../../tollgate/agent/v1/ReportRequest';
import type { ReportResponse as _tollgate_agent_v1_ReportResponse, ReportResponse__Output as _tollgate_agent_v1_ReportResponse__Output } from '../../../tollgate/agent/v1/ReportResponse';
import type { ReturnRequest as _tollgate_agent_v1_ReturnRequest, ReturnRequest__Output as _tollgate_agent_v1_ReturnRequest__Output } from '../../../tollgate/agent/v1/ReturnRequest';
import type { ReturnResponse as _tollgate_agent_v1_ReturnResponse, ReturnResponse__Output as _tollgate_agent_v1_ReturnResponse__Output } from '../../../tollgate/agent/v1/ReturnResponse';
import type { StatusRequest as _tollgate_agent_v1_StatusRequest, StatusRequest__Output as _tollgate_agent_v1_StatusRequest__Output } from '../../../tollgate/agent/v1/StatusRequest';
import type { StatusResponse as _tollgate_agent_v1_StatusResponse, StatusResponse__Output as _tollgate_agent_v1_StatusResponse__Output } from '../../../tollgate/agent/v1/StatusResponse';
import type { TryAcquireRequest as _tollgate_agent_v1_TryAcquireRequest, TryAcquireRequest__Output as _tollgate_agent_v1_TryAcquireRequest__Output } from '../../../tollgate/agent/v1/TryAcquireRequest';

export interface AgentClient extends grpc.Client {
  Acquire(argument: _tollgate_agent_v1_AcquireRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  Acquire(argument: _tollgate_agent_v1_AcquireRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  Acquire(argument: _tollgate_agent_v1_AcquireRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  Acquire(argument: _tollgate_agent_v1_AcquireRequest, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  acquire(argument: _tollgate_agent_v1_AcquireRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  acquire(argument: _tollgate_agent_v1_AcquireRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  acquire(argument: _tollgate_agent_v1_AcquireRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  acquire(argument: _tollgate_agent_v1_AcquireRequest, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  
  Charge(argument: _tollgate_agent_v1_ChargeRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ChargeResponse__Output>): grpc.ClientUnaryCall;
  Charge(argument: _tollgate_agent_v1_ChargeRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_ChargeResponse__Output>): grpc.ClientUnaryCall;
  Charge(argument: _tollgate_agent_v1_ChargeRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ChargeResponse__Output>): grpc.ClientUnaryCall;
  Charge(argument: _tollgate_agent_v1_ChargeRequest, callback: grpc.requestCallback<_tollgate_agent_v1_ChargeResponse__Output>): grpc.ClientUnaryCall;
  charge(argument: _tollgate_agent_v1_ChargeRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ChargeResponse__Output>): grpc.ClientUnaryCall;
  charge(argument: _tollgate_agent_v1_ChargeRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_ChargeResponse__Output>): grpc.ClientUnaryCall;
  charge(argument: _tollgate_agent_v1_ChargeRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ChargeResponse__Output>): grpc.ClientUnaryCall;
  charge(argument: _tollgate_agent_v1_ChargeRequest, callback: grpc.requestCallback<_tollgate_agent_v1_ChargeResponse__Output>): grpc.ClientUnaryCall;
  
  CheckKeys(argument: _tollgate_v1_CheckRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  CheckKeys(argument: _tollgate_v1_CheckRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  CheckKeys(argument: _tollgate_v1_CheckRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  CheckKeys(argument: _tollgate_v1_CheckRequest, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  checkKeys(argument: _tollgate_v1_CheckRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  checkKeys(argument: _tollgate_v1_CheckRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  checkKeys(argument: _tollgate_v1_CheckRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  checkKeys(argument: _tollgate_v1_CheckRequest, callback: grpc.requestCallback<_tollgate_v1_CheckResponse__Output>): grpc.ClientUnaryCall;
  
  Report(argument: _tollgate_agent_v1_ReportRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ReportResponse__Output>): grpc.ClientUnaryCall;
  Report(argument: _tollgate_agent_v1_ReportRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_ReportResponse__Output>): grpc.ClientUnaryCall;
  Report(argument: _tollgate_agent_v1_ReportRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ReportResponse__Output>): grpc.ClientUnaryCall;
  Report(argument: _tollgate_agent_v1_ReportRequest, callback: grpc.requestCallback<_tollgate_agent_v1_ReportResponse__Output>): grpc.ClientUnaryCall;
  report(argument: _tollgate_agent_v1_ReportRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ReportResponse__Output>): grpc.ClientUnaryCall;
  report(argument: _tollgate_agent_v1_ReportRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_ReportResponse__Output>): grpc.ClientUnaryCall;
  report(argument: _tollgate_agent_v1_ReportRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ReportResponse__Output>): grpc.ClientUnaryCall;
  report(argument: _tollgate_agent_v1_ReportRequest, callback: grpc.requestCallback<_tollgate_agent_v1_ReportResponse__Output>): grpc.ClientUnaryCall;
  
  Return(argument: _tollgate_agent_v1_ReturnRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ReturnResponse__Output>): grpc.ClientUnaryCall;
  Return(argument: _tollgate_agent_v1_ReturnRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_ReturnResponse__Output>): grpc.ClientUnaryCall;
  Return(argument: _tollgate_agent_v1_ReturnRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ReturnResponse__Output>): grpc.ClientUnaryCall;
  Return(argument: _tollgate_agent_v1_ReturnRequest, callback: grpc.requestCallback<_tollgate_agent_v1_ReturnResponse__Output>): grpc.ClientUnaryCall;
  return(argument: _tollgate_agent_v1_ReturnRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ReturnResponse__Output>): grpc.ClientUnaryCall;
  return(argument: _tollgate_agent_v1_ReturnRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_ReturnResponse__Output>): grpc.ClientUnaryCall;
  return(argument: _tollgate_agent_v1_ReturnRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_ReturnResponse__Output>): grpc.ClientUnaryCall;
  return(argument: _tollgate_agent_v1_ReturnRequest, callback: grpc.requestCallback<_tollgate_agent_v1_ReturnResponse__Output>): grpc.ClientUnaryCall;
  
  Status(argument: _tollgate_agent_v1_StatusRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_StatusResponse__Output>): grpc.ClientUnaryCall;
  Status(argument: _tollgate_agent_v1_StatusRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_StatusResponse__Output>): grpc.ClientUnaryCall;
  Status(argument: _tollgate_agent_v1_StatusRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_StatusResponse__Output>): grpc.ClientUnaryCall;
  Status(argument: _tollgate_agent_v1_StatusRequest, callback: grpc.requestCallback<_tollgate_agent_v1_StatusResponse__Output>): grpc.ClientUnaryCall;
  status(argument: _tollgate_agent_v1_StatusRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_StatusResponse__Output>): grpc.ClientUnaryCall;
  status(argument: _tollgate_agent_v1_StatusRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_StatusResponse__Output>): grpc.ClientUnaryCall;
  status(argument: _tollgate_agent_v1_StatusRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_StatusResponse__Output>): grpc.ClientUnaryCall;
  status(argument: _tollgate_agent_v1_StatusRequest, callback: grpc.requestCallback<_tollgate_agent_v1_StatusResponse__Output>): grpc.ClientUnaryCall;
  
  TryAcquire(argument: _tollgate_agent_v1_TryAcquireRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  TryAcquire(argument: _tollgate_agent_v1_TryAcquireRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  TryAcquire(argument: _tollgate_agent_v1_TryAcquireRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  TryAcquire(argument: _tollgate_agent_v1_TryAcquireRequest, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  tryAcquire(argument: _tollgate_agent_v1_TryAcquireRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  tryAcquire(argument: _tollgate_agent_v1_TryAcquireRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  tryAcquire(argument: _tollgate_agent_v1_TryAcquireRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  tryAcquire(argument: _tollgate_agent_v1_TryAcquireRequest, callback: grpc.requestCallback<_tollgate_agent_v1_AcquireResponse__Output>): grpc.ClientUnaryCall;
  
}

export interface AgentHandlers extends grpc.UntypedServiceImplementation {
  Acquire: grpc.handleUnaryCall<_tollgate_agent_v1_AcquireRequest__Output, _tollgate_agent_v1_AcquireResponse>;
  
  Charge: grpc.handleUnaryCall<_tollgate_agent_v1_ChargeRequest__Output, _tollgate_agent_v1_ChargeResponse>;
  
  CheckKeys: grpc.handleUnaryCall<_tollgate_v1_CheckRequest__Output, _tollgate_v1_CheckResponse>;
  
  Report: grpc.handleUnaryCall<_tollgate_agent_v1_ReportRequest__Output, _tollgate_agent_v1_ReportResponse>;
  
  Return: grpc.handleUnaryCall<_tollgate_agent_v1_ReturnRequest__Output, _tollgate_agent_v1_ReturnResponse>;
  
  Status: grpc.handleUnaryCall<_tollgate_agent_v1_StatusRequest__Output, _tollgate_agent_v1_StatusResponse>;
  
  TryAcquire: grpc.handleUnaryCall<_tollgate_agent_v1_TryAcquireRequest__Output, _tollgate_agent_v1_AcquireResponse>;
  
}

export interface AgentDefinition extends grpc.ServiceDefinition {
  Acquire: MethodDefinition<_tollgate_agent_v1_AcquireRequest, _tollgate_agent_v1_AcquireResponse, _tollgate_agent_v1_AcquireRequest__Output, _tollgate_agent_v1_AcquireResponse__Output>
  Charge: MethodDefinition<_tollgate_agent_v1_ChargeRequest, _tollgate_agent_v1_ChargeResponse, _tollgate_agent_v1_ChargeRequest__Output, _tollgate_agent_v1_ChargeResponse__Output>
  CheckKeys: MethodDefinition<_tollgate_v1_CheckRequest, _tollgate_v1_CheckResponse, _tollgate_v1_CheckRequest__Output, _tollgate_v1_CheckResponse__Output>
  Report: MethodDefinition<_tollgate_agent_v1_ReportRequest, _tollgate_agent_v1_ReportResponse, _tollgate_agent_v1_ReportRequest__Output, _tollgate_agent_v1_ReportResponse__Output>
  Return: MethodDefinition<_tollgate_agent_v1_ReturnRequest, _tollgate_agent_v1_ReturnResponse, _tollgate_agent_v1_ReturnRequest__Output, _tollgate_agent_v1_ReturnResponse__Output>
  Status: MethodDefinition<_tollgate_agent_v1_StatusRequest, _tollgate_agent_v1_StatusResponse, _tollgate_agent_v1_StatusRequest__Output, _tollgate_agent_v1_StatusResponse__Output>
  TryAcquire: MethodDefinition<_tollgate_agent_v1_TryAcquireRequest, _tollgate_agent_v1_AcquireResponse, _tollgate_agent_v1_TryAcquireRequest__Output, _tollgate_agent_v1_AcquireResponse__Output>
}
