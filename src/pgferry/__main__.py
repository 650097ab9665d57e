from pgferry.cli import main

main()
