"""A single-node RocketMQ 5 endpoint over a MessageStore: the gRPC ``MessagingService`` that
RocketMQ's proxy serves, so the official clients (``rocketmq-python-client``) produce and
consume through the store unchanged. Needs the ``endpoint`` extra (grpcio, protobuf) and the
protocol bindings of ``rocketmq-python-client``.

    from rmqstore import MessageStore
    from rmqstore.endpoint import serve
    serve(MessageStore("/data/store"), "127.0.0.1:8081")   # until SIGINT / SIGTERM
"""
import os

# gRPC's fork handlers restart its poller threads in a forked child; a child that then
# closes its descriptors before exec (subprocess with preexec_fn, as PySpark launches its
# JVM) can die of it: 6 in 300 such children failed here with grpcio 1.85. Off unless
# the user chose (it must be set before grpc is first imported).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from rmqstore.endpoint.server import Endpoint, serve  # noqa: E402

__all__ = ["Endpoint", "serve"]
