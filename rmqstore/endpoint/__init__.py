"""A single-node RocketMQ 5 endpoint over a MessageStore: the gRPC ``MessagingService`` that
RocketMQ's proxy serves, so the official clients (``rocketmq-python-client``) produce and
consume through the store unchanged. Needs the ``endpoint`` extra (grpcio, protobuf) and the
protocol bindings of ``rocketmq-python-client``.

    from rmqstore import MessageStore
    from rmqstore.endpoint import serve
    serve(MessageStore("/data/store"), "127.0.0.1:8081")   # until SIGINT / SIGTERM
"""
from rmqstore.endpoint.server import Endpoint, serve

__all__ = ["Endpoint", "serve"]
