"""The ``trainplan`` subcommands, one module each (``run(args) -> exit code``); ``trainplan.cli`` parses the
command line and imports the one it runs, so ``trainplan estimate`` loads neither pandas nor torch."""
