from tidal.cli.main import main

raise SystemExit(main())
