"""Ray Data / Ray Train jobs: thin adapters that load resources once per actor and call ``ctrlgen``.

Each job module is runnable as ``python -m ray_jobs.<job> --config ...`` and from the
``ctrlgen`` CLI. The first job (entity extraction) lands with issue 3.
"""
