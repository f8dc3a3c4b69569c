module github.com/palisade-dev/palisade/clients/go

go 1.22
