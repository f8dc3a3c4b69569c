module github.com/palisade-dev/palisade/tests/conformance/go

go 1.22

require github.com/palisade-dev/palisade/clients/go v0.0.0

replace github.com/palisade-dev/palisade/clients/go => ../../../clients/go
