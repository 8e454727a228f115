"""Shell completion for `tidebatch completion bash|zsh|fish`: scripts generated from the
argparse tree (tree.py), so they list exactly the subcommands, flags and choices the
parser accepts, and need no Python at TAB time."""
