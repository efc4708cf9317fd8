// Original file: proto/tollgate/agent/v1/agent.proto


export interface ChargeResponse {
}

export interface ChargeResponse__Output {
}
