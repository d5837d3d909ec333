"""AMD's gfx950 code objects: the manifest of known builds, finding them, checking their ELF,
handing them to the launcher."""
