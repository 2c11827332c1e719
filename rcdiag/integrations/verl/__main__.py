"""``python -m rcdiag.integrations.verl <verl's arguments> +rcdiag.dump_dir=DIR``."""

from rcdiag.integrations.verl.launch import main

if __name__ == "__main__":
    main()
