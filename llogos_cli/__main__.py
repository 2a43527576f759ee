from llogos_cli.cli.main import main

main()
