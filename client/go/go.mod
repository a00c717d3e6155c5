module sluice.dev/client

go 1.19

require github.com/vmihailenco/msgpack/v5 v5.3.5

require github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
