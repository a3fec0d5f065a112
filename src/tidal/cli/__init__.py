"""Thin, typed command-line front end. The only layer that reads the environment or prints."""
