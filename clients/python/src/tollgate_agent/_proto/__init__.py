"""Modules generated from proto/tollgate by generate.sh: do not edit."""
