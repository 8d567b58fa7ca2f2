# attacks: array.concat doubling an array 40 times, and array.flatten of the result
# expect: deny
package wb.admission

x0 := numbers.range(1, 1000)

x1 := array.concat(x0, x0)

x2 := array.concat(x1, x1)

x3 := array.concat(x2, x2)

x4 := array.concat(x3, x3)

x5 := array.concat(x4, x4)

x6 := array.concat(x5, x5)

x7 := array.concat(x6, x6)

x8 := array.concat(x7, x7)

x9 := array.concat(x8, x8)

x10 := array.concat(x9, x9)

x11 := array.concat(x10, x10)

x12 := array.concat(x11, x11)

x13 := array.concat(x12, x12)

x14 := array.concat(x13, x13)

x15 := array.concat(x14, x14)

x16 := array.concat(x15, x15)

x17 := array.concat(x16, x16)

x18 := array.concat(x17, x17)

x19 := array.concat(x18, x18)

x20 := array.concat(x19, x19)

flat := array.flatten([x20, x20, x20, x20])

deny contains "never" if count(flat) < 0
