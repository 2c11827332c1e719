"""``python -m rcdiag``."""

from rcdiag.cli import main

if __name__ == "__main__":
    main()
