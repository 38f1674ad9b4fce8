"""The collector's ports and children, bounded: gRPC limits and guards, the HTTP server, subprocesses."""
