"""Host input the exporter and the nsys tools both read, kept below both (neither imports the other's
code for it): `hostio.files` reads files anyone may have put on the host without blocking or reading
more than asked; `hostio.answers` reads HTTP answers from outside within one deadline per whole request,
a cap of bytes and a cap of parsed JSON values."""
