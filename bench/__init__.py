"""Benchmarks: policy planning (`make bench-policy`) and the HTTPS server (`make bench`).

Run as modules from the repository root (``python -m bench.policy_bench``), so
that the shared Pod and AdmissionReview builders in :mod:`bench.pods` import
the same way for both.
"""
