# attacks: opa.runtime reads the control plane's environment variables and configuration
# expect: compile_error
package wb.admission

deny contains msg if {
	env := opa.runtime().env
	msg := sprintf("%v", [env])
}
