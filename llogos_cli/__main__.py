from llogos_cli.cli import main

main()
