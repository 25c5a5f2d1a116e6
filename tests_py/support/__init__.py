"""Helpers shared by the test files (fixtures and pytest hooks stay in
conftest.py). Imports nothing itself: the per-CPU-build child processes
import support.sample_run with nothing but torch and fuseops installed."""
