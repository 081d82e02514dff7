"""gRPC reflection lists the services of the gateway and the worker (what `grpcurl list` shows);
both servers run with `--reflection` here (it is off by default)."""

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase


def services(target: str) -> set[str]:
    with grpc.insecure_channel(target) as ch:
        return set(ProtoReflectionDescriptorDatabase(ch).get_services())


def test_reflection_lists_the_services(servers):
    gw = services(servers.grpc_target)
    assert {"tandem.agent.v1.AgentService", "grpc.health.v1.Health"} <= gw, gw
    assert "tandem.step.v1.StepService" in services(servers.worker_target)
