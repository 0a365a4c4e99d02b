module github.com/allot-dev/allot/deploy

go 1.26.0
