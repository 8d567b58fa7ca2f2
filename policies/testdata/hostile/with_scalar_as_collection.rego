# attacks: with putting a builtin that answers a collection (json.patch) in the place of one that answers a boolean (equal): its answer skipped the value check, forty copy operations made a value of 2^40 elements written out from [1], and comparing two of them held a core for hours past the deadline
# expect: compile_error
package wb.admission

ops := [{"op": "copy", "from": "", "path": "/-"} | some _ in numbers.range(1, 40)]

deny contains "slow" if {
	x := equal([1], ops) with equal as json.patch
	y := equal([1], ops) with equal as json.patch
	x == y
}
