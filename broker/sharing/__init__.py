"""Instances shared by identical requests (registry.py) and parked warm for the
same user's next profile (warm.py)."""
