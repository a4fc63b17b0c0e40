"""``python -m remediation.cli``: the console script (``remediation``) without installing it."""

from remediation.cli.console import main

main()
