"""Ray Serve deployments (ICL / prefix generation with batched token blocking, metrics).

Apps are built by ``build_app(args)`` functions that Serve YAML names by import path;
the first deployment lands with the generation issues.
"""
