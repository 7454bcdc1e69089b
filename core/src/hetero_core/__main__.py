from hetero_core.cli.main import console_main

console_main()
