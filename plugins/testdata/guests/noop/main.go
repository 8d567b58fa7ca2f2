package main

import "wb/plugins/sdk"

func init() { sdk.Handle(func(sdk.Input) sdk.Decision { return sdk.Allow() }) }

func main() {}
