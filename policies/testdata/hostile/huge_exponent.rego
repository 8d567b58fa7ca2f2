# attacks: a number literal whose exact value has a billion digits (expanded by integer arithmetic)
# expect: compile_error
package wb.admission

deny contains "never" if 1e999999999 + 1 < 0
