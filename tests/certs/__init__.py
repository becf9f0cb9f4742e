"""Tests for the standalone ``certs`` package."""
