from dsim.entry import main

main()
