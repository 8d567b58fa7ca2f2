# attacks: OPA's type checker: rules of 16 references to rules of 16 references, 8 deep, take it minutes at upload
# expect: compile_error
package wb.admission

a0 := ["0123456789abcdef", "0123456789abcdef"]

a1 := [a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0]

a2 := [a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1]

a3 := [a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2]

a4 := [a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3]

a5 := [a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4]

a6 := [a5, a5, a5, a5, a5, a5, a5, a5, a5, a5, a5, a5, a5, a5, a5, a5]

a7 := [a6, a6, a6, a6, a6, a6, a6, a6, a6, a6, a6, a6, a6, a6, a6, a6]

a8 := [a7, a7, a7, a7, a7, a7, a7, a7, a7, a7, a7, a7, a7, a7, a7, a7]

deny contains "never" if count(a8) < 0
