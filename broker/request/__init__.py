"""Resolving an attach request: the program and object, its parameters, pids and libraries."""
