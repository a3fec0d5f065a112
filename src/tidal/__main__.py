from tidal.cli.main import entry

entry()
