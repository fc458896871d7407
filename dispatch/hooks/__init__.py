"""Coding-agent integration: classifying shell commands, hook answers, PATH shims."""
