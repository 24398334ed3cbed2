"""Completion events and their offline analysis. Reads events; never loads a model."""
