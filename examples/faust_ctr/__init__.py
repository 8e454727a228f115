"""Example Faust app: CTR scoring with tidebatch's adaptive batches (see README.md)."""
