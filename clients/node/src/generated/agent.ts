import type * as grpc from '@grpc/grpc-js';
import type { MessageTypeDefinition } from '@grpc/proto-loader';

import type { Duration as _google_protobuf_Duration, Duration__Output as _google_protobuf_Duration__Output } from './google/protobuf/Duration';
import type { Timestamp as _google_protobuf_Timestamp, Timestamp__Output as _google_protobuf_Timestamp__Output } from './google/protobuf/Timestamp';
import type { AcquireRequest as _tollgate_agent_v1_AcquireRequest, AcquireRequest__Output as _tollgate_agent_v1_AcquireRequest__Output } from './tollgate/agent/v1/AcquireRequest';
import type { AcquireResponse as _tollgate_agent_v1_AcquireResponse, AcquireResponse__Output as _tollgate_agent_v1_AcquireResponse__Output } from './tollgate/agent/v1/AcquireResponse';
import type { AgentClient as _tollgate_agent_v1_AgentClient, AgentDefinition as _tollgate_agent_v1_AgentDefinition } from './tollgate/agent/v1/Agent';
import type { ChargeRequest as _tollgate_agent_v1_ChargeRequest, ChargeRequest__Output as _tollgate_agent_v1_ChargeRequest__Output } from './tollgate/agent/v1/ChargeRequest';
import type { ChargeResponse as _tollgate_agent_v1_ChargeResponse, ChargeResponse__Output as _tollgate_agent_v1_ChargeResponse__Output } from './tollgate/agent/v1/ChargeResponse';
import type { ReportRequest as _tollgate_agent_v1_ReportRequest, ReportRequest__Output as _tollgate_agent_v1_ReportRequest__Output } from './tollgate/agent/v1/ReportRequest';
import type { ReportResponse as _tollgate_agent_v1_ReportResponse, ReportResponse__Output as _tollgate_agent_v1_ReportResponse__Output } from './tollgate/agent/v1/ReportResponse';
import type { ReturnRequest as _tollgate_agent_v1_ReturnRequest, ReturnRequest__Output as _tollgate_agent_v1_ReturnRequest__Output } from './tollgate/agent/v1/ReturnRequest';
import type { ReturnResponse as _tollgate_agent_v1_ReturnResponse, ReturnResponse__Output as _tollgate_agent_v1_ReturnResponse__Output } from './tollgate/agent/v1/ReturnResponse';
import type { StatusRequest as _tollgate_agent_v1_StatusRequest, StatusRequest__Output as _tollgate_agent_v1_StatusRequest__Output } from './tollgate/agent/v1/StatusRequest';
import type { StatusResponse as _tollgate_agent_v1_StatusResponse, StatusResponse__Output as _tollgate_agent_v1_StatusResponse__Output } from './tollgate/agent/v1/StatusResponse';
import type { TryAcquireRequest as _tollgate_agent_v1_TryAcquireRequest, TryAcquireRequest__Output as _tollgate_agent_v1_TryAcquireRequest__Output } from './tollgate/agent/v1/TryAcquireRequest';
import type { CheckAnswer as _tollgate_v1_CheckAnswer, CheckAnswer__Output as _tollgate_v1_CheckAnswer__Output } from './tollgate/v1/CheckAnswer';
import type { CheckItem as _tollgate_v1_CheckItem, CheckItem__Output as _tollgate_v1_CheckItem__Output } from './tollgate/v1/CheckItem';
import type { CheckRequest as _tollgate_v1_CheckRequest, CheckRequest__Output as _tollgate_v1_CheckRequest__Output } from './tollgate/v1/CheckRequest';
import type { CheckResponse as _tollgate_v1_CheckResponse, CheckResponse__Output as _tollgate_v1_CheckResponse__Output } from './tollgate/v1/CheckResponse';
import type { KeyLimitsClient as _tollgate_v1_KeyLimitsClient, KeyLimitsDefinition as _tollgate_v1_KeyLimitsDefinition } from './tollgate/v1/KeyLimits';

type SubtypeConstructor<Constructor extends new (...args: any) => any, Subtype> = {
  new(...args: ConstructorParameters<Constructor>): Subtype;
};

export interface ProtoGrpcType {
  google: {
    protobuf: {
      Duration: MessageTypeDefinition<_google_protobuf_Duration, _google_protobuf_Duration__Output>
      Timestamp: MessageTypeDefinition<_google_protobuf_Timestamp, _google_protobuf_Timestamp__Output>
    }
  }
  tollgate: {
    agent: {
      v1: {
        AcquireRequest: MessageTypeDefinition<_tollgate_agent_v1_AcquireRequest, _tollgate_agent_v1_AcquireRequest__Output>
        AcquireResponse: MessageTypeDefinition<_tollgate_agent_v1_AcquireResponse, _tollgate_agent_v1_AcquireResponse__Output>
        Agent: SubtypeConstructor<typeof grpc.Client, _tollgate_agent_v1_AgentClient> & { service: _tollgate_agent_v1_AgentDefinition }
        ChargeRequest: MessageTypeDefinition<_tollgate_agent_v1_ChargeRequest, _tollgate_agent_v1_ChargeRequest__Output>
        ChargeResponse: MessageTypeDefinition<_tollgate_agent_v1_ChargeResponse, _tollgate_agent_v1_ChargeResponse__Output>
        ReportRequest: MessageTypeDefinition<_tollgate_agent_v1_ReportRequest, _tollgate_agent_v1_ReportRequest__Output>
        ReportResponse: MessageTypeDefinition<_tollgate_agent_v1_ReportResponse, _tollgate_agent_v1_ReportResponse__Output>
        ReturnRequest: MessageTypeDefinition<_tollgate_agent_v1_ReturnRequest, _tollgate_agent_v1_ReturnRequest__Output>
        ReturnResponse: MessageTypeDefinition<_tollgate_agent_v1_ReturnResponse, _tollgate_agent_v1_ReturnResponse__Output>
        StatusRequest: MessageTypeDefinition<_tollgate_agent_v1_StatusRequest, _tollgate_agent_v1_StatusRequest__Output>
        StatusResponse: MessageTypeDefinition<_tollgate_agent_v1_StatusResponse, _tollgate_agent_v1_StatusResponse__Output>
        TryAcquireRequest: MessageTypeDefinition<_tollgate_agent_v1_TryAcquireRequest, _tollgate_agent_v1_TryAcquireRequest__Output>
      }
    }
    v1: {
      CheckAnswer: MessageTypeDefinition<_tollgate_v1_CheckAnswer, _tollgate_v1_CheckAnswer__Output>
      CheckItem: MessageTypeDefinition<_tollgate_v1_CheckItem, _tollgate_v1_CheckItem__Output>
      CheckRequest: MessageTypeDefinition<_tollgate_v1_CheckRequest, _tollgate_v1_CheckRequest__Output>
      CheckResponse: MessageTypeDefinition<_tollgate_v1_CheckResponse, _tollgate_v1_CheckResponse__Output>
      KeyLimits: SubtypeConstructor<typeof grpc.Client, _tollgate_v1_KeyLimitsClient> & { service: _tollgate_v1_KeyLimitsDefinition }
    }
  }
}

