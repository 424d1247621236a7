"""Python frames in profiles (issue 23), the client's half: which files are
interpreters the BPF walker follows (discover.py), and decoding what it
copied: strings (strings.py) and line numbers (linetable.py)."""
