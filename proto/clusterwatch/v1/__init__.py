"""Generated protobuf and gRPC code for the clusterwatch v1 protocol (see the .proto files here)."""
